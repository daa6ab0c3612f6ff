//! Runtime plumbing shared by the handler binaries.
