package legacy

import (
	"context"
	"fmt"

	"github.com/coreos/go-systemd/v22/dbus"
)

// DBusSystemd talks to systemd over its private socket (root only), or
// the system bus when that is not there.
type DBusSystemd struct {
	conn *dbus.Conn
}

// NewDBusSystemd connects to systemd.
func NewDBusSystemd(ctx context.Context) (*DBusSystemd, error) {
	c, err := dbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		c, err = dbus.NewWithContext(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to systemd: %w", err)
	}
	return &DBusSystemd{conn: c}, nil
}

// Close closes the connection.
func (s *DBusSystemd) Close() { s.conn.Close() }

// UnitExists reports whether the unit is loaded or has a unit file.
func (s *DBusSystemd) UnitExists(ctx context.Context, unit string) (bool, error) {
	st, err := s.conn.ListUnitsByNamesContext(ctx, []string{unit})
	if err != nil {
		return false, err
	}
	for _, u := range st {
		if u.Name == unit && u.LoadState != "not-found" {
			return true, nil
		}
	}
	files, err := s.conn.ListUnitFilesByPatternsContext(ctx, nil, []string{unit})
	if err != nil {
		return false, err
	}
	return len(files) > 0, nil
}

// StopAndDisable stops the unit, waits for the job and disables it.
func (s *DBusSystemd) StopAndDisable(ctx context.Context, unit string) error {
	ch := make(chan string, 1)
	if _, err := s.conn.StopUnitContext(ctx, unit, "replace", ch); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("stop job: %s", res)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := s.conn.DisableUnitFilesContext(ctx, []string{unit}, false); err != nil {
		return fmt.Errorf("disable: %w", err)
	}
	return s.conn.ReloadContext(ctx)
}

// Mask masks the unit persistently and reloads systemd.
func (s *DBusSystemd) Mask(ctx context.Context, unit string) error {
	if _, err := s.conn.MaskUnitFilesContext(ctx, []string{unit}, false, true); err != nil {
		return fmt.Errorf("mask: %w", err)
	}
	return s.conn.ReloadContext(ctx)
}

// Reload makes systemd read the unit files again.
func (s *DBusSystemd) Reload(ctx context.Context) error { return s.conn.ReloadContext(ctx) }

// Masked reports whether the unit's load state is "masked".
func (s *DBusSystemd) Masked(ctx context.Context, unit string) (bool, error) {
	st, err := s.conn.ListUnitsByNamesContext(ctx, []string{unit})
	if err != nil {
		return false, err
	}
	for _, u := range st {
		if u.Name == unit && u.LoadState == "masked" {
			return true, nil
		}
	}
	return false, nil
}
