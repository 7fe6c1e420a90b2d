"""Scenarios: YAML → validated dataclasses (config), user extensions, and building one replica from them (build)."""
