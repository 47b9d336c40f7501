"""Domain types of the platform: job states, failure reasons, typed errors. No I/O."""
