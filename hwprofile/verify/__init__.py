"""``hwprofile verify``: greedy answers of a tuned plan against a baseline without speculative decoding.

- :mod:`.prompts`: the reference prompts (the shipped ``hwprofile/data/verify_prompts.yaml`` or a
  user's file), validated with file and line;
- :mod:`.runner`: greedy requests to a running server, one at a time, with token ids (side effects:
  HTTP on loopback, never through a proxy);
- :mod:`.compare`: per prompt exact match, first difference, similarity; the verdict (pure);
- :mod:`.report`: the ``hwprofile.verify/1`` JSON document and its text form (pure).

Serving the two plans one after the other is the command's job (``hwprofile/cli/verify.py``, through
:func:`hwprofile.launch.start.serving`).
"""
