"""Matching: which profile fits a host snapshot. Pure functions over data; nothing is probed here."""
