"""Build real vLLM engines as ``vllm serve`` would build them and print what each settled on: run by
:func:`vllmtools.engine_kv` (the KV tests), never imported.

Argument: a JSON list of ``[case, model, [serve arguments...]]``. Each case's arguments are parsed by
``vllm serve``'s own parser and its engine config made in the API server's usage context (the defaults
``vllm serve`` takes). vLLM is imported once; each engine is then built in a process forked from this
one, in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): not an API server, an EngineCore and a worker
process each importing vLLM again. What differs from a server: the executor (one process, where vLLM's
CPU platform turns a server's into its multiprocess one), ``LLMEngine`` in place of the API server's
engine client, and no statistics. None of them sizes the KV cache: its bytes are
``--kv-cache-memory-bytes``, its layout the worker's KV specs and the config's cache mode, and the
engine core resolves the capacity and block size from them the same way (vllm/v1/engine/core.py).
(Two engines one after another in one process do not work: vLLM registers its Triton kernel overrides
once per process, and a second registration fails.)

Per case, stdout gets ``@@CASE <case>`` before the engine's own log and ``@@KV <json>`` after it: the
token capacity vLLM resolved (the figure of its ``KV cache size: N tokens`` line), the block size it
settled on (the smallest of its prefix-cacheable groups') and its full-attention layers' block (the
attention block a hybrid model's state pages raise; None without full attention). A case that fails
prints its traceback and ``@@FAIL``; the next case still runs.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import traceback


def build(model: str, args: list[str]) -> dict[str, object]:
    """The engine ``vllm serve <model> <args>`` would start, built here, and what it settled on. No
    teardown: the forked process that calls this exits next."""
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
    cache = engine.vllm_config.cache_config
    return {
        "kv_tokens": cache.kv_cache_size_tokens,
        "block_size": cache.block_size,
        "attention_block_size": cache.effective_attention_block_size,
    }


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for module in ("vllm.entrypoints.cli.serve", "vllm.v1.engine.llm_engine"):
        importlib.import_module(module)  # once, before the forks
    # no Python thread may hold a lock across the forks (the native pools vLLM's imports start are
    # the ones vLLM's own fork-started processes inherit too)
    assert threading.active_count() == 1, threading.enumerate()
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
