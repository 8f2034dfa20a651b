//! `gpuctl`: the command-line client. All logic lives in the library's `cli` module.
fn main() {
    std::process::exit(gpuctl::cli::run());
}
