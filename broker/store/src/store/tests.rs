//! Unit tests of the facade and its parts, on a store in a temporary directory.
