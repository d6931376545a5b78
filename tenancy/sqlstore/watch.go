package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// keysChannel is the channel migration 0002's trigger notifies.
const keysChannel = "inferrail_keys"

// Bounds of the key watch.
const (
	// watchPing: a watch that heard nothing this long checks its
	// connection, so a dead server or network is noticed (and the watch
	// started again) within watchPing + watchPingTimeout.
	watchPing        = 30 * time.Second
	watchPingTimeout = 5 * time.Second
	// The wait before connecting again doubles from watchRetryMin to
	// watchRetryMax, and starts over once a watch was established.
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 30 * time.Second
	// watchCloseTimeout bounds closing a watch's connection.
	watchCloseTimeout = time.Second
)

// WatchKeys implements tenancy.KeyWatcher: it LISTENs on a connection of
// its own (one beyond the pool) for the key table's notifications.
func (s *pgStore) WatchKeys(ctx context.Context, changed func(id string), state func(err error)) error {
	wait := watchRetryMin
	for {
		established, err := s.watchOnce(ctx, changed, state)
		if ctx.Err() != nil {
			return nil
		}
		state(err)
		if established {
			wait = watchRetryMin
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(2*wait, watchRetryMax)
	}
}

// watchOnce listens until the connection fails or ctx ends; established
// says LISTEN succeeded first.
func (s *pgStore) watchOnce(ctx context.Context, changed func(string), state func(error)) (established bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, fmt.Errorf("postgres store: watch keys: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), watchCloseTimeout)
		conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+keysChannel); err != nil {
		return false, fmt.Errorf("postgres store: watch keys: %w", err)
	}
	state(nil)
	changed("") // what changed before LISTEN was not heard
	for {
		wctx, cancel := context.WithTimeout(ctx, watchPing)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			if n.Channel == keysChannel {
				changed(n.Payload)
			}
		case ctx.Err() != nil:
			return true, nil
		case errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err):
			pctx, cancel := context.WithTimeout(ctx, watchPingTimeout)
			err = conn.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				return true, fmt.Errorf("postgres store: watch keys: ping: %w", err)
			}
		default:
			return true, fmt.Errorf("postgres store: watch keys: %w", err)
		}
	}
}
