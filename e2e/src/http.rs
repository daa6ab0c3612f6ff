//! The few HTTP exchanges the harness needs with the servers it starts (the S3 filer's listing
//! and objects, Prometheus's API), on a plain TCP connection, no client library.

use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1.0 `GET` asking for JSON (1.0, so the answer is never chunked), bounded to 10 s:
/// the status code and the body.
pub async fn get(ip: Ipv4Addr, port: u16, target: &str) -> Result<(u16, String), String> {
    request("GET", ip, port, target, "").await
}

/// One HTTP/1.0 exchange: `method` on `target` with `body` (none when empty), bounded to 10 s:
/// the status code and the body.
pub async fn request(
    method: &str,
    ip: Ipv4Addr,
    port: u16,
    target: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = TcpStream::connect((ip, port)).await?;
        let mut request = format!(
            "{method} {target} HTTP/1.0\r\nHost: {ip}:{port}\r\nAccept: application/json\r\n"
        );
        if !body.is_empty() {
            request.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        request.push_str("\r\n");
        request.push_str(body);
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| format!("{method} {target}: no answer within 10 s"))?
        .map_err(|e| format!("{method} {target}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{method} {target}: no header end in {response:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("{method} {target}: no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// `value` percent-encoded for a query string: every byte but the unreserved ones of RFC 3986.
pub fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn a_promql_query_is_encoded_for_a_query_string() {
        assert_eq!(
            encode(r#"max by (a) (m{b=~"x|y"}) > 0"#),
            "max%20by%20%28a%29%20%28m%7Bb%3D~%22x%7Cy%22%7D%29%20%3E%200"
        );
    }
}
