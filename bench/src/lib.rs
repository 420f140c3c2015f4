//! quiver-bench: placeholder until its issue lands.
