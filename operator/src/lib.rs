//! quiver-operator: placeholder until its issue lands.
