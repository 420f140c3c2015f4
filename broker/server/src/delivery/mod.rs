//! The broker's background deliveries, each one round of a periodic loop or a thread of its
//! own: delayed messages ([`delays`]), timed messages ([`timers`]) and the transaction
//! check-back ([`check_back`]). They store through `crate::service::produce`; the state they
//! advance (delay offsets, the timer store, settled half messages) is theirs or the
//! broker's.

pub(crate) mod check_back;
pub(crate) mod delays;
pub(crate) mod revive;
pub(crate) mod timers;
