"""Running scenarios: today one replica per run (runner); routers and prefill/decode pools live here too."""
