//! See docs/CONTRACT.md. Being written.
