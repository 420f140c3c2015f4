//! What a client can send and Quiver does not implement: refused with
//! REQUEST_CODE_NOT_SUPPORTED and a remark naming the code and why, never accepted.

use quiver_protocol::code::{request, response};

use super::Refusal;

/// The refusal of a request code no processor serves.
pub fn refusal(code: i32) -> Refusal {
    let name = request::name(code).unwrap_or("unknown");
    Refusal::new(
        response::REQUEST_CODE_NOT_SUPPORTED,
        format!("request code {code} ({name}) is not supported"),
    )
}
