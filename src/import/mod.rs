//! Importers: other tools' GPU layouts → gpuctl policy drop-ins.
//!
//! Each importer is pure (text in, drop-in text out, plus what it could not express); the CLI
//! (`gpuctl import`) reads and writes the files.

pub mod mig_parted;
