"""Hydra's configs, a package (tf_harness.conf) so that they install with the code and
`pkg://tf_harness.conf` finds them, in a checkout and installed alike."""
