package ec2

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// TagAPI is the part of the EC2 client TagReporter uses.
type TagAPI interface {
	CreateTags(ctx context.Context, in *ec2.CreateTagsInput, opts ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
}

// TagReporter runs on the node: it writes the recipe's progress as tags on
// its own instance, which `ec2 launch` reads back.
type TagReporter struct {
	API        TagAPI
	InstanceID string
}

// Report writes the current step and status.
func (r TagReporter) Report(ctx context.Context, step, status string) error {
	_, err := r.API.CreateTags(ctx, &ec2.CreateTagsInput{
		Resources: []string{r.InstanceID},
		Tags: []types.Tag{
			{Key: aws.String(TagStep), Value: aws.String(step)},
			{Key: aws.String(TagStatus), Value: aws.String(status)},
		},
	})
	if err != nil {
		return fmt.Errorf("report progress: %w", err)
	}
	return nil
}
