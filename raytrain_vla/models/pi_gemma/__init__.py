"""What pi0 and pi0.5 share: PaliGemma (SigLIP + Gemma 2B) with a Gemma action expert."""
