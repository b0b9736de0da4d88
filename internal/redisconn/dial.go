package redisconn

import (
	"context"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// dialErrorsAtFirstUse hands a failed dial to go-redis as a connection that
// fails with the dial's error on first use, instead of as a dial error.
//
// Why: go-redis's pool (v9.23, internal/pool.ConnPool) counts failed dials
// and, once PoolSize of them have failed without a successful background
// dial between, stops dialing: every command then fails at once with the
// last dial error while one goroutine retries the dial once a second
// (tryDial; go-redis issue #3062). After a Redis restart the client thus
// stays down for up to a second after Redis answers again (measured: 0.38–
// 0.96 s, depending on where in that second Redis came back), and the
// limiter's breaker, whose probe PINGs through the same pool every 200 ms,
// cannot see Redis back before the pool does. The limiter already paces
// its own use of a Redis that is down (the breaker: no decision goes to
// Redis while it is open, one probe per interval), so the pool's second
// breaker only adds that delay. The error the caller gets is unchanged:
// the dial's own, returned from the connection's first read or write,
// which go-redis makes during the handshake (HELLO) and then discards the
// connection.
//
// It is a hook rather than a Dialer so that it sits above go-redis's own
// dialers: the TLS one, and a Sentinel client's, whose failure to learn the
// master's address from the sentinels is a dial error too.
type dialErrorsAtFirstUse struct{}

func (dialErrorsAtFirstUse) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return failedConn{err: err}, nil //nolint:nilerr // the error reaches the caller from the connection, see above
		}
		return c, nil
	}
}

func (dialErrorsAtFirstUse) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialErrorsAtFirstUse) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// failedConn is a connection whose dial failed with err.
type failedConn struct{ err error }

func (c failedConn) Read([]byte) (int, error)       { return 0, c.err }
func (c failedConn) Write([]byte) (int, error)      { return 0, c.err }
func (failedConn) Close() error                     { return nil }
func (failedConn) LocalAddr() net.Addr              { return unknownAddr{} }
func (failedConn) RemoteAddr() net.Addr             { return unknownAddr{} }
func (failedConn) SetDeadline(time.Time) error      { return nil }
func (failedConn) SetReadDeadline(time.Time) error  { return nil }
func (failedConn) SetWriteDeadline(time.Time) error { return nil }

type unknownAddr struct{}

func (unknownAddr) Network() string { return "tcp" }
func (unknownAddr) String() string  { return "" }
