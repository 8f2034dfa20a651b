//! See issue 2.
