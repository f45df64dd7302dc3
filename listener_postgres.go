package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
	"github.com/eventfeed/subscriptions/internal/ident"
	"github.com/eventfeed/subscriptions/internal/secret"
)

// DefaultListenerReconnectDelay is how long PostgresListener waits before
// re-establishing a failed LISTEN connection.
const DefaultListenerReconnectDelay = 5 * time.Second

const (
	// listenerApplicationName is the application_name the listener's
	// connection reports (unless the DSN sets one), so that operators can
	// find it in pg_stat_activity.
	listenerApplicationName = "subscriptions-listener"

	// listenerConnectTimeout bounds one connection attempt when the DSN has
	// no connect_timeout: a blackholed host would otherwise hold Run in the
	// dial for the operating system's TCP timeout (minutes).
	listenerConnectTimeout = 10 * time.Second

	// listenerCloseTimeout bounds the polite Terminate message sent when the
	// connection is closed; the socket is closed regardless.
	listenerCloseTimeout = 5 * time.Second
)

// listenerKeepAlive makes a silently dead connection (a crashed host, a
// dropped NAT entry) fail the blocked read within about half a minute, so
// the listener reconnects instead of waiting forever for notifications
// that cannot arrive. Go's default TCP keep-alive would take minutes.
var listenerKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// PostgresListener holds a dedicated Postgres connection LISTENing for the
// event store's commit notifications and fans them out as subscriber wake
// signals: every Subscribe() channel receives each notification, so one
// listener serves any number of subscribers in the process. Notifications
// are never load-bearing: while the connection is down — or if a NOTIFY is
// missed entirely — subscribers still make progress through their poll
// interval.
//
// The connection is a plain pgx connection, not one borrowed from a pool: a
// LISTEN belongs to a session, and a pooled connection would be handed to
// other users (or closed by the pool) while it is listening. Run owns it: Run
// opens it, is the only goroutine that uses it, and closes it before
// returning. The DSN must therefore reach Postgres directly or through a
// session-mode pooler (transaction-mode poolers do not support LISTEN). The
// connection reports application_name "subscriptions-listener" unless the
// DSN sets one, gives up connecting after 10 s unless the DSN sets
// connect_timeout, and uses TCP keep-alives tight enough that a silently
// dead connection fails (and is replaced) within about half a minute.
//
// The listener owns the channels Subscribe returns: it is their only sender
// and never closes them, not even when Run returns, so subscribers keep a
// valid channel (and fall back to polling) whatever the listener's state.
//
// A PostgresListener is safe for concurrent use: Subscribe may be called
// from any goroutine, before or while Run runs. Run itself runs once at a
// time per listener. Nothing it logs or returns contains the DSN's
// password.
type PostgresListener struct {
	config  *pgx.ConnConfig
	target  string   // user@host:port/database, for logs: never the password
	secrets []string // strings scrubbed from every logged error, longest first

	channel        string
	ident          string // channel as a quoted SQL identifier
	logger         *slog.Logger
	reconnectDelay time.Duration

	running atomic.Bool
	subs    fanout
}

// PostgresListenerOption configures a PostgresListener.
type PostgresListenerOption func(*PostgresListener)

// WithListenerChannel overrides the NOTIFY channel (default
// infrastructure.PostgresNotifyChannel, "pericarp_events"). The name is used
// verbatim as a quoted identifier, so any name (mixed case, spaces, quotes)
// is safe; an empty name, one longer than 63 bytes or one containing a NUL
// byte could never be notified and is rejected by NewPostgresListener.
func WithListenerChannel(channel string) PostgresListenerOption {
	return func(l *PostgresListener) { l.channel = channel }
}

// WithListenerLogger sets the logger for connection failures (default
// slog.Default(); nil falls back to the default).
func WithListenerLogger(logger *slog.Logger) PostgresListenerOption {
	return func(l *PostgresListener) { l.logger = logger }
}

// WithListenerReconnectDelay sets the wait between reconnect attempts
// (default DefaultListenerReconnectDelay). A delay <= 0 is refused by
// NewPostgresListener, as every out-of-range option value is (the rule
// NewSubscriber follows too): reconnecting without a pause would hammer a
// server that is down, and silently substituting the default would hide
// the mistake.
func WithListenerReconnectDelay(d time.Duration) PostgresListenerOption {
	return func(l *PostgresListener) { l.reconnectDelay = d }
}

// NewPostgresListener creates a listener for the given Postgres DSN. Call
// Run to start it and pass each subscriber its own Subscribe() channel via
// WithWakeSignal.
//
// The DSN (URL or key=value form, as pgx accepts it) is parsed here, so a
// malformed one is reported at once, with an error that names the problem
// but never contains the password. Nothing is connected until Run: a
// server that is down now is not an error.
func NewPostgresListener(dsn string, opts ...PostgresListenerOption) (*PostgresListener, error) {
	l := &PostgresListener{
		channel:        infrastructure.PostgresNotifyChannel,
		reconnectDelay: DefaultListenerReconnectDelay,
	}
	for _, opt := range opts {
		if opt != nil {
			opt(l)
		}
	}
	if l.logger == nil {
		l.logger = slog.Default()
	}
	if l.reconnectDelay <= 0 {
		return nil, fmt.Errorf("subscriptions: NewPostgresListener: reconnect delay %v must be positive (WithListenerReconnectDelay)", l.reconnectDelay)
	}
	if err := ident.CheckChannel(l.channel); err != nil {
		return nil, fmt.Errorf("subscriptions: NewPostgresListener: %w (WithListenerChannel)", err)
	}
	l.ident = pgx.Identifier{l.channel}.Sanitize()

	secrets := secret.FromDSN(dsn)
	config, err := pgx.ParseConfig(dsn)
	if err != nil {
		// Only the scrubbed text is kept, not the error itself: pgx's
		// ParseConfigError carries the raw connection string.
		return nil, fmt.Errorf("subscriptions: NewPostgresListener: invalid Postgres DSN: %s", secret.Scrub(err.Error(), secrets))
	}
	// The password may also come from PGPASSWORD or a .pgpass file.
	l.secrets = secret.Normalize(append(secrets, config.Password))

	if config.RuntimeParams["application_name"] == "" {
		config.RuntimeParams["application_name"] = listenerApplicationName
	}
	if config.ConnectTimeout <= 0 {
		config.ConnectTimeout = listenerConnectTimeout
	}
	dialer := &net.Dialer{KeepAliveConfig: listenerKeepAlive}
	config.DialFunc = dialer.DialContext
	l.config = config
	l.target = fmt.Sprintf("%s@%s:%d/%s", config.User, config.Host, config.Port, config.Database)
	return l, nil
}

// Subscribe returns a channel that receives after each notification.
// Every subscriber needs its own channel (a Go channel receive is
// point-to-point, not broadcast — sharing one channel would wake only one
// subscriber per notification). Channels are buffered and sends never
// block.
//
// Each channel has a buffer of one (one pending signal covers any number
// of commits), is never closed, and is kept for the listener's lifetime:
// call Subscribe once per subscriber. It may be called before or while Run
// runs; every channel also receives a signal each time the connection is
// (re)established, since events may have committed while it was down.
func (l *PostgresListener) Subscribe() <-chan struct{} {
	return l.subs.subscribe()
}

// Run maintains the LISTEN connection until ctx is cancelled, reconnecting
// with a delay on any failure. It returns nil on cancellation; connection
// errors are logged, never fatal — polling subscribers keep making progress
// while the listener is down.
//
// A server that is down when Run starts is retried like a lost connection.
// After every successful LISTEN, each subscriber gets one wake signal:
// commits made while the listener was not listening were announced to
// nobody. Run blocks the calling goroutine, which owns the connection; on
// return the connection is closed and nothing Run started is still
// running. Calling Run while another call on the same listener is still
// running returns an error at once (a second connection would only
// duplicate every signal).
func (l *PostgresListener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return errors.New("subscriptions: PostgresListener.Run: already running")
	}
	defer l.running.Store(false)

	failures := 0
	for {
		connected, err := l.listen(ctx, failures)
		if ctx.Err() != nil {
			return nil
		}
		if connected {
			failures = 0
		}
		failures++
		msg := "subscriptions: postgres listener: connecting failed; retrying"
		if connected {
			msg = "subscriptions: postgres listener: connection lost; reconnecting"
		}
		l.logger.Warn(msg, "channel", l.channel, "server", l.target,
			"consecutive_failures", failures, "retry_in", l.reconnectDelay, "error", secret.Scrub(err.Error(), l.secrets))
		if !ctxsleep.Sleep(ctx, l.reconnectDelay) {
			return nil
		}
	}
}

// listen connects, LISTENs and relays notifications until the connection
// fails or ctx is cancelled; it always returns a non-nil error. connected
// reports whether the LISTEN was established (so the failure is a lost
// connection rather than a failed attempt).
func (l *PostgresListener) listen(ctx context.Context, failures int) (connected bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, l.config)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), listenerCloseTimeout)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+l.ident); err != nil {
		return false, fmt.Errorf("LISTEN %s: %w", l.ident, err)
	}
	l.logger.Info("subscriptions: postgres listener: listening", "channel", l.channel, "server", l.target, "after_failures", failures)
	// Whatever committed while nobody was listening was announced to no
	// one: every subscriber takes one look now that new commits will be.
	l.subs.notify()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		l.subs.notify()
	}
}
