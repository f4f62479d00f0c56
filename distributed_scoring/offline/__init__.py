"""Real pretrained masked LMs carried by PyPI packages, and germline antibody data for the demo."""
