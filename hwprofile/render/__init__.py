"""Rendering: a plan instance formatted for the vLLM release that will run it (argv, shell line,
``--config`` YAML, environment file, systemd unit, JSON). Version decisions are made in
:mod:`.translate`; the templates in ``templates/`` only format."""
