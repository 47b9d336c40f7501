"""Training backends (torch now; megatron later) and the Relax checkpoint layout."""
