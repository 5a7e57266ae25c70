package pveapi

import "context"

// Get reads an API path (relative to the API base, query included) into
// v: the read-only requests of `pve-inspectd doctor` (version, the token's
// permissions, storages, SDN, pools), which need no method of their own.
func (c *Client) Get(ctx context.Context, path string, v any) error {
	if err := c.c.Get(ctx, path, v); err != nil {
		return classify("GET "+path, err)
	}
	return nil
}
