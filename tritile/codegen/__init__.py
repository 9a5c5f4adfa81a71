"""Code generators from the final tile IR to a backend's source (only Gluon for now)."""
