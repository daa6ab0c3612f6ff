//! The build script of the four handler binaries (each package's `build` points here).
//!
//! Release binaries on Linux with glibc are linked with `-z pack-relative-relocs`: the 20,000
//! relative relocations of a position-independent binary are stored as a bitmap (`DT_RELR`)
//! instead of 24 bytes each in `.rela.dyn` (about 480 KB a binary), which the loader reads
//! whole at every start, so all of it stayed resident. Still a position-independent executable
//! (address randomisation is kept); the binary needs glibc 2.36 or later (Debian 12, the
//! image's base). A linker that does not know the option ignores it with a warning.
//! `common::memory` lists it, with its figure, beside the other memory work.

fn main() {
    println!("cargo::rerun-if-changed=../common/handler_build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("PROFILE") == "release"
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu"
    {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
