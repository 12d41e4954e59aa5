"""Prompts: Jinja2 templates (``*.j2``), prompt modes, rendering and answer parsing.

Knows nothing about engines: it turns game state and personas into text, and text
back into numbers.
"""
