"""Paper reproductions: one module per paper, each with run_reproduction(out_dir, ...)."""
