//! quiver-client: placeholder until its issue lands.
