"""The pi0 family (models/pi_gemma)."""
