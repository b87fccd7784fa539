"""HTTP routes, dependencies and error handling."""
