//go:build !linux

package probe

import "errors"

// sendRaw needs Linux packet sockets.
func sendRaw(int, [][]byte) error {
	return errors.New("raw frames need Linux")
}
