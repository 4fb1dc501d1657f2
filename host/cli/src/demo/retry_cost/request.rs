//! What a client sends, sized as the study accounts for it: the first attempt is a 1,920-character payload, a
//! retry that payload plus a 1,800-character transcript allowance (what the agent re-sends about its failure).

/// Characters in one execution's request: the study's payload.
pub const PAYLOAD_CHARS: usize = 1_920;
/// Characters a retry adds: the study's transcript allowance.
pub const TRANSCRIPT_CHARS: usize = 1_800;
/// The tool the client calls.
pub const TOOL: &str = "refund_order";

/// The customer's words that fill the payload to the study's size (the arguments must be identical on every
/// attempt: they are what the server's args dedupe and once's fingerprint cover).
const NOTE: &str = "Customer writes: the blender arrived with a cracked jar, please refund the $200 part of order \
                    1234 to the original card. ";
/// What a retrying agent tells the tool about the attempts before.
const TRANSCRIPT: &str = "Previous attempt: no reply within 0.12 s; the outcome is unknown; retrying as policy says. ";

/// The tool's arguments, in canonical (RFC 8785) form, sized so the first request's body is [`PAYLOAD_CHARS`].
pub fn args() -> String {
    let empty = body("call-00000000-01", &args_with(""), false).len();
    args_with(&filler(NOTE, PAYLOAD_CHARS.saturating_sub(empty)))
}

/// The request body of one attempt: the call, and on a retry the transcript allowance.
pub fn body(call_id: &str, args: &str, retry: bool) -> String {
    let transcript = if retry {
        // `,"transcript":""` is 16 characters of the allowance.
        format!(r#","transcript":"{}""#, filler(TRANSCRIPT, TRANSCRIPT_CHARS - 16))
    } else {
        String::new()
    };
    format!(r#"{{"tool":"{TOOL}","call_id":"{call_id}","args":{args}{transcript}}}"#)
}

fn args_with(note: &str) -> String {
    format!(r#"{{"amount":200,"note":"{note}","order_id":1234}}"#)
}

/// `text` repeated and cut to `len` characters (ASCII, nothing to escape).
fn filler(text: &str, len: usize) -> String {
    text.chars().cycle().take(len).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_request_is_the_payload_and_a_retry_adds_the_allowance() {
        let args = args();
        assert_eq!(body("call-00000007-01", &args, false).len(), PAYLOAD_CHARS);
        assert_eq!(
            body("call-00000007-02", &args, true).len(),
            PAYLOAD_CHARS + TRANSCRIPT_CHARS
        );
        let parsed: serde_json::Value = serde_json::from_str(&body("call-1", &args, true)).unwrap();
        assert_eq!(parsed["args"]["amount"], 200);
    }
}
