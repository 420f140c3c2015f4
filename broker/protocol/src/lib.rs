//! quiver-protocol: placeholder until its issue lands.
