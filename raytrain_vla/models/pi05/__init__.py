"""The pi05 family (models/pi_gemma)."""
