"""End-to-end tests of looprelay with the real, pinned Claude Code CLI (tests/claude_cli.py)."""
