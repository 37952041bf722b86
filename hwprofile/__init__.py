"""hwprofile: hardware-aware launch profiles for vLLM."""

__version__ = "0.1.0"
