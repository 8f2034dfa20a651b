//! Simulated GPU hosts (see issue 2): `--simulate h100-80gb*8`.
