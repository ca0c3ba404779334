"""The runner agent, laid out as its lifecycle: register, poll, apply, report."""
