package dedup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The RESP2 codec of the direct connections (WithDirectConnections): just what the
// store's commands need. Requests are arrays of bulk strings; replies are the five
// RESP2 types.

// replyError is an error reply from the server. Like go-redis's own, it implements
// redis.Error, so redis.HasErrorPrefix and failedRoundTrip treat it as a reply.
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as a redis.Error.
func (e replyError) RedisError() {}

var _ redis.Error = replyError("")

// Bounds on a reply: the store's replies are records and small arrays (a script's is
// two integers, or three with a record), so anything larger means a broken stream,
// not a value to allocate. A record holds at most a stored reply of MaxReplyLimit,
// its owner token and its fingerprint.
const (
	maxBulk  = MaxReplyLimit + 1<<20 // bytes of a bulk string
	maxArray = 1024                  // elements of an array
	maxDepth = 8                     // arrays within arrays
)

// appendCommand appends args as a RESP array of bulk strings. The store's commands
// hold strings and integers only; anything else is an error, before a byte is sent.
func appendCommand(b []byte, args []any) ([]byte, error) {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		var num [20]byte
		var s []byte
		switch v := a.(type) {
		case string:
			b = appendBulkHeader(b, len(v))
			b = append(b, v...)
			b = append(b, '\r', '\n')
			continue
		case []byte:
			s = v
		case int:
			s = strconv.AppendInt(num[:0], int64(v), 10)
		case int64:
			s = strconv.AppendInt(num[:0], v, 10)
		default:
			return b, fmt.Errorf("dedup: direct connection cannot send a %T argument", a)
		}
		b = appendBulkHeader(b, len(s))
		b = append(b, s...)
		b = append(b, '\r', '\n')
	}
	return b, nil
}

func appendBulkHeader(b []byte, n int) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// errProtocol is a reply stream the codec cannot read: the connection is dropped.
var errProtocol = errors.New("dedup: direct connection: malformed reply")

// readReply reads one reply: a string (simple or bulk), an int64, a []any, nil (a
// nil bulk or array), or a replyError as the value of an error reply. err is for the
// stream only: after one, the connection is unusable.
func readReply(r *bufio.Reader) (any, error) { return readReplyDepth(r, 0) }

func readReplyDepth(r *bufio.Reader, depth int) (any, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errProtocol
		}
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, errProtocol
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return string(body), nil
	case '-':
		return replyError(body), nil
	case ':':
		n, err := strconv.ParseInt(string(body), 10, 64)
		if err != nil {
			return nil, errProtocol
		}
		return n, nil
	case '$':
		n, err := strconv.Atoi(string(body))
		switch {
		case err != nil || n < -1 || n > maxBulk:
			return nil, errProtocol
		case n == -1:
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return nil, errProtocol
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(string(body))
		switch {
		case err != nil || n < -1 || n > maxArray || depth >= maxDepth:
			return nil, errProtocol
		case n == -1:
			return nil, nil
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReplyDepth(r, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, errProtocol
}

// setReply gives cmd the reply v, as go-redis would have: a nil reply is redis.Nil,
// an error reply the command's error. The store sends StatusCmd and Cmd only.
func setReply(cmd redis.Cmder, v any) error {
	if e, ok := v.(replyError); ok {
		cmd.SetErr(e)
		return nil
	}
	if v == nil {
		cmd.SetErr(redis.Nil)
		return nil
	}
	cmd.SetErr(nil) // an earlier attempt's error reply (retried) is not the answer
	switch c := cmd.(type) {
	case *redis.StatusCmd:
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("dedup: direct connection: %T reply to %s", v, c.Name())
		}
		c.SetVal(s)
	case *redis.Cmd:
		c.SetVal(nestedErrors(v))
	default:
		return fmt.Errorf("dedup: direct connection cannot read a reply into %T", cmd)
	}
	return nil
}

// nestedErrors turns error replies inside arrays into errors, as go-redis reads them.
func nestedErrors(v any) any {
	a, ok := v.([]any)
	if !ok {
		return v
	}
	for i, e := range a {
		switch e := e.(type) {
		case replyError:
			a[i] = error(e)
		case []any:
			a[i] = nestedErrors(e)
		}
	}
	return a
}
