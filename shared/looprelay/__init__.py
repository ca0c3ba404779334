"""looprelay: GitHub activity to AI coding-agent sessions."""
