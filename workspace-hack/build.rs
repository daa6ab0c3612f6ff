//! Empty: a build script is what makes cargo count the `[build-dependencies]` below, the
//! features of the build scripts' and procedural macros' dependencies.
fn main() {}
