"""bench package."""
