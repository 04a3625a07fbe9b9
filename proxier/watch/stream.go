package watch

import (
	"bufio"
	"io"
	"net/http"
)

// Reading watch streams in large reads.
//
// The streaming decoder reads a watch response one object at a time: a
// 4-byte length, then the object. Over HTTP/2, every read of a response
// body counts the bytes against the flow-control windows, and Go's client
// returns them to the server (WINDOW_UPDATE frames on the connection and
// the stream, one flush, one TLS record, one write) as soon as a few
// kilobytes are owed. Listing a large cluster through the watch-list
// stream therefore wrote one small frame to the API server for every few
// objects, which both ends paid for in syscalls while the proxy waited for
// its list. Read through a buffer, the body is read in large pieces (what
// HTTP/2 holds, up to the buffer), so the windows are returned once per
// piece. A buffer's read returns what is there without waiting for more,
// so no event is held back.

// streamBufferSize is the read size of a watch response body.
const streamBufferSize = 64 << 10

// BufferStreams wraps an API client's transport (rest.Config.Wrap) so
// that the body of every watch response is read through a buffer.
func BufferStreams(rt http.RoundTripper) http.RoundTripper { return bufferedStreams{rt} }

type bufferedStreams struct{ rt http.RoundTripper }

func (b bufferedStreams) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(req)
	if err != nil || resp.Body == nil || !isWatch(req) {
		return resp, err
	}
	resp.Body = bufferedBody{Reader: bufio.NewReaderSize(resp.Body, streamBufferSize), Closer: resp.Body}
	return resp, nil
}

// WrappedRoundTripper lets client-go reach the transport underneath (for
// CloseIdleConnections, for one).
func (b bufferedStreams) WrappedRoundTripper() http.RoundTripper { return b.rt }

// isWatch tells a watch request (client-go sets watch=true) from others,
// whose bodies the decoder reads whole anyway.
func isWatch(req *http.Request) bool {
	w := req.URL.Query().Get("watch")
	return w == "true" || w == "1"
}

type bufferedBody struct {
	*bufio.Reader
	io.Closer
}
