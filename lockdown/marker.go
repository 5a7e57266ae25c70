package lockdown

import (
	"errors"
	"fmt"
	"os"
)

// SetMarker creates (on) or removes (off) the marker file. Creating a
// marker that exists and removing one that does not are not errors.
func SetMarker(path string, on bool) error {
	if !on {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove lockdown marker: %w", err)
		}
		return nil
	}
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("create lockdown marker: %w", err)
	}
	_, werr := f.WriteString("egress lockdown requested (pve-inspectd lockdown on)\n")
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("create lockdown marker: %w", err)
	}
	return nil
}

// MarkerPresent reports whether the marker exists; an error other than
// "does not exist" counts as present, with the error.
func MarkerPresent(path string) (bool, error) {
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	default:
		return true, fmt.Errorf("check lockdown marker: %w", err)
	}
}
