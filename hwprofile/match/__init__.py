"""Matching: which profile fits a host snapshot. Nothing is probed here: profiles and rules are read
from their YAML files (built-in and the config root), then matching is pure functions over data."""
