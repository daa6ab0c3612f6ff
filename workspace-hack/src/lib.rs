//! No code: the package's dependencies are what matter. Each workspace member but
//! multigres-api depends on it, so every cargo command compiles each third-party dependency with
//! the same features and reuses the workspace's crates (.config/hakari.toml).
