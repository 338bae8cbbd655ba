//! Planning tests.
