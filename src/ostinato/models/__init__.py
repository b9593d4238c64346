"""Model families served by the runtime."""
