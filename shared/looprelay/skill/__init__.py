"""The loop's Claude Code skill, shipped as package data (``SKILL.md``, ``reference/*.md``)."""
