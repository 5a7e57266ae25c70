package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
)

func newTokenCmd(g *globals) *cobra.Command {
	var file string
	store := func() (*auth.Store, error) {
		if file != "" {
			return auth.Open(file), nil
		}
		c, err := g.loadConfig()
		if err != nil {
			return nil, err
		}
		return auth.Open(c.API.TokenFile), nil
	}
	cmd := &cobra.Command{Use: "token", Short: "manage bearer tokens of the sandbox API's TCP listener"}
	cmd.PersistentFlags().StringVar(&file, "token-file", "", "token file (default: api.token_file from the config)")

	var scopes []string
	var owner string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "create a token and print it once (only its hash is stored)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			var sc []string
			for _, x := range scopes {
				sc = append(sc, strings.Split(x, ",")...)
			}
			tok, _, err := s.CreateOwned(args[0], owner, sc, time.Now())
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), tok)
			return err
		},
	}
	create.Flags().StringArrayVar(&scopes, "scope", []string{"read"}, "scope: read, exec or admin (repeatable or comma-separated; admin > exec > read)")
	create.Flags().StringVar(&owner, "owner", "", "bind the token to this owner: it sees and touches only that owner's sandboxes and creates sandboxes for it")

	list := &cobra.Command{
		Use:   "list",
		Short: "list tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			l, err := s.List()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tOWNER\tCREATED")
			for _, t := range l {
				owner := t.Owner
				if owner == "" {
					owner = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, strings.Join(t.Scopes, ","), owner, t.Created.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID|NAME",
		Short: "revoke a token (takes effect at the next request, no restart)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			return s.Revoke(args[0])
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}
