"""The trainer binary and its jobs (controller, trainer, evaler, decoder)."""
