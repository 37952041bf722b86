"""Build real vLLM engines as ``vllm serve`` would build them and print what each settled on: run by
:func:`vllmtools.engine_kv` (the KV tests), never imported.

Argument: a JSON list of ``[case, model, [serve arguments...]]``. Each case's arguments are parsed by
``vllm serve``'s own parser and its engine config made in the API server's usage context, so the
engine is the one ``vllm serve <model> <arguments>`` starts. vLLM is imported once; each engine is then
built in a process forked from this one, in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the
caller): not an API server, an EngineCore and a worker process each importing vLLM again, and the KV
cache sized by the same code. (Two engines one after another in one process do not work: vLLM
registers its Triton kernel overrides once per process, and a second registration fails.) Per case,
stdout gets ``@@CASE <case>`` before the engine's own log and ``@@KV <json>`` after it: the token
capacity vLLM resolved (the figure of its ``KV cache size: N tokens`` line) and the block size it
settled on. A case that fails prints its traceback and ``@@FAIL``; the next case still runs.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import traceback


def build(model: str, args: list[str]) -> dict[str, object]:
    from vllm.distributed import cleanup_dist_env_and_memory
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import make_arg_parser
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.llm_engine import LLMEngine

    ns = make_arg_parser(FlexibleArgumentParser()).parse_args([model, *args])
    ns.model = ns.model_tag
    config = AsyncEngineArgs.from_cli_args(ns).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER
    )
    engine = LLMEngine.from_vllm_config(config, UsageContext.OPENAI_API_SERVER, disable_log_stats=True)
    try:
        cache = engine.vllm_config.cache_config
        return {"kv_tokens": cache.kv_cache_size_tokens, "block_size": cache.block_size}
    finally:
        engine.engine_core.shutdown()
        del engine
        gc.collect()
        cleanup_dist_env_and_memory()


def main() -> int:
    for module in ("vllm.entrypoints.cli.serve", "vllm.v1.engine.llm_engine"):
        importlib.import_module(module)  # once, before the forks
    failed = 0
    for case, model, args in json.loads(sys.argv[1]):
        print(f"@@CASE {case}", flush=True)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the case's own process, from a vLLM not yet set up by another engine
            code = 1
            try:
                settled = build(model, args)
                print("@@KV " + json.dumps({"case": case, **settled}), flush=True)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"@@FAIL {case} (exit {os.waitstatus_to_exitcode(status)})", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
