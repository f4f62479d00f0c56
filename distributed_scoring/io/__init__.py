"""Bytes in and out, without torch: storage and URIs, input discovery, shard planning and readers,
N-best readers, column schemas, and the run folder (its claim, fingerprint, shard files, markers, lock,
provenance).
"""
