//! The transcript shape of issue 18, shared by the bench and the
//! `transcript_check` example: turns of a user message, an assistant turn
//! with three parallel tool calls, their three results of about 200 bytes
//! each, and an assistant reply; written as one JSON array, one message per
//! line.

use std::fmt::Write as _;

use leasehold_transcript::Format;

/// Parallel calls per assistant turn.
pub const PARALLEL: usize = 3;

/// A generated transcript as JSON array text.
pub struct Shaped {
    pub text: String,
    pub messages: usize,
}

/// Generates about `size` messages (whole turns) of `format`. With
/// `corrupt`, every 50th turn loses a result, every 70th duplicates one, and
/// every 90th carries an orphan result, so repair has work to do.
pub fn issue_shape(format: Format, size: usize, corrupt: bool) -> Shaped {
    let mut messages: Vec<String> = Vec::with_capacity(size + 16);
    let mut turn = 0usize;
    while messages.len() < size {
        let ids: Vec<String> = (0..PARALLEL).map(|k| format!("call_{turn}_{k}")).collect();
        let mut results: Vec<String> = Vec::new();
        for (k, id) in ids.iter().enumerate() {
            if corrupt && turn % 50 == 49 && k == PARALLEL - 1 {
                continue;
            }
            results.push(result(format, id, turn));
        }
        if corrupt && turn % 70 == 69 {
            results.push(result(format, &ids[0], turn));
        }
        if corrupt && turn % 90 == 89 {
            results.push(result(format, &format!("call_{turn}_z"), turn));
        }
        messages.push(user(format, turn));
        match format {
            Format::OpenAiChat => {
                let calls: Vec<String> = ids
                    .iter()
                    .map(|id| {
                        format!(
                            r#"{{"id":"{id}","type":"function","function":{{"name":"shell","arguments":"{{\"cmd\":\"ls -la /srv/{turn}/{id}\"}}"}}}}"#
                        )
                    })
                    .collect();
                messages.push(format!(
                    r#"{{"role":"assistant","content":"Checking all three.","tool_calls":[{}]}}"#,
                    calls.join(",")
                ));
                messages.extend(results);
            }
            Format::Anthropic => {
                let uses: Vec<String> = ids
                    .iter()
                    .map(|id| {
                        format!(
                            r#"{{"type":"tool_use","id":"{id}","name":"bash","input":{{"command":"ls -la /srv/{turn}/{id}"}}}}"#
                        )
                    })
                    .collect();
                messages.push(format!(
                    r#"{{"role":"assistant","content":[{{"type":"text","text":"Checking all three."}},{}]}}"#,
                    uses.join(",")
                ));
                messages.push(format!(
                    r#"{{"role":"user","content":[{}]}}"#,
                    results.join(",")
                ));
            }
            Format::OpenAiResponses => {
                messages.push(format!(
                    r#"{{"type":"reasoning","id":"rs_{turn}","summary":[]}}"#
                ));
                for id in &ids {
                    messages.push(format!(
                        r#"{{"type":"function_call","id":"fc_{id}","call_id":"{id}","name":"shell","arguments":"{{\"cmd\":\"ls -la /srv/{turn}/{id}\"}}"}}"#
                    ));
                }
                messages.extend(results);
            }
        }
        messages.push(reply(format, turn));
        turn += 1;
    }
    let count = messages.len();
    let mut text = String::with_capacity(messages.iter().map(|m| m.len() + 2).sum::<usize>() + 4);
    text.push_str("[\n");
    text.push_str(&messages.join(",\n"));
    text.push_str("\n]\n");
    Shaped {
        text,
        messages: count,
    }
}

fn user(format: Format, turn: usize) -> String {
    match format {
        Format::OpenAiResponses => format!(
            r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":"Please look at server {turn}."}}]}}"#
        ),
        _ => format!(r#"{{"role":"user","content":"Please look at server {turn}."}}"#),
    }
}

fn reply(format: Format, turn: usize) -> String {
    match format {
        Format::OpenAiChat => {
            format!(r#"{{"role":"assistant","content":"Server {turn} looks fine."}}"#)
        }
        Format::Anthropic => format!(
            r#"{{"role":"assistant","content":[{{"type":"text","text":"Server {turn} looks fine."}}]}}"#
        ),
        Format::OpenAiResponses => format!(
            r#"{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"Server {turn} looks fine."}}]}}"#
        ),
    }
}

/// A result whose payload is 200 bytes of `ls -l` output (with `\n`
/// escapes, as real tool output has).
fn result(format: Format, id: &str, turn: usize) -> String {
    let mut output = format!("total 12\\ndrwxr-xr-x 2 root root 4096 Nov 30 {id}\\n");
    let mut line = 0;
    while output.len() < 200 {
        // Writing to a String cannot fail.
        let _ = write!(output, "-rw-r--r-- 1 root root {turn:>5} log.{line}\\n");
        line += 1;
    }
    output.truncate(200);
    if output.ends_with('\\') {
        output.pop();
    }
    match format {
        Format::OpenAiChat => {
            format!(r#"{{"role":"tool","tool_call_id":"{id}","content":"{output}"}}"#)
        }
        Format::Anthropic => {
            format!(r#"{{"type":"tool_result","tool_use_id":"{id}","content":"{output}"}}"#)
        }
        Format::OpenAiResponses => {
            format!(r#"{{"type":"function_call_output","call_id":"{id}","output":"{output}"}}"#)
        }
    }
}
