//! Property test of the readers and type coercion.
